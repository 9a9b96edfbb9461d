"""The DDP trainer run by torchrun (`python -m trainer`): training, checkpoints and the data-wait vs compute report."""
