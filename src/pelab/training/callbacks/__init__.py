"""The Lightning callbacks of a training run, one per module: those of conf/callbacks/ (`checkpoint`,
`progress_bar`, `throughput`, `retrieval`) and those the run's builder always adds (`preemption`,
`summary_updates`, `along_training` with `eval.at`)."""
