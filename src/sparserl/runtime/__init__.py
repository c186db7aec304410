"""What every training stage runs on: the processes of a data-parallel job (:mod:`.dist`), the
learning-rate schedule and the training state saved beside a checkpoint (:mod:`.optim`), and the
metrics every stage logs (:mod:`.metrics`). Pre-training, SFT, RL and ``improve`` share it; none of
it knows a stage."""
