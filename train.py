"""Train one model (or a sweep with -m): pelab.tasks.train. See README.md; configs in conf/."""
from pelab.tasks.train import main

if __name__ == "__main__":
    main()
