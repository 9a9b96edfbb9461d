"""The scaling study (`python -m trainer.scaling`): the trainer at several world sizes, measured, then
predicted past this machine and priced (study, report, chart, predict, cost, comm_sweep)."""
