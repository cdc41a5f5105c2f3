"""Train one model (or a sweep with -m). See README.md; configs in conf/."""
from pelab.tasks.train import main

if __name__ == "__main__":
    main()
