"""What to build: targets (model x graph x precision x chip x toolchain), the stage table, build paths, code keys."""
