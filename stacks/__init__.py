"""Stages and stacks: compose the constructs of training_constructs/ and grant between them, nothing else."""
