"""Train, evaluate or sweep any zoo method: ``python train.py +method=<name> [group=option ...]``.

Same as the console script ``zoo-train``; see README.md.
"""

from zoo.cli.train import main

if __name__ == "__main__":
    main()
