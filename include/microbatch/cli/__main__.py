"""`python -m microbatch.cli`: the console entry point, as the `microbatch` script runs it."""

from microbatch.cli.entry import main

if __name__ == "__main__":
    main()
