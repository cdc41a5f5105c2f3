"""Evaluate a checkpoint (pelab.tasks.evaluate): python eval.py ckpt_path=PATH [pe.* / eval.* / probes.*]."""
from pelab.tasks.evaluate import main

if __name__ == "__main__":
    main()
