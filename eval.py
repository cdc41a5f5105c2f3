"""Evaluate a checkpoint: python eval.py ckpt_path=PATH [eval.* / probes.* / pe.scaling.* overrides]."""
from pelab.tasks.evaluate import main

if __name__ == "__main__":
    main()
