"""What runs inside `Trainer.fit`: the LightningModule (`module`), its optimizer and schedule (`optimizer`), the
callbacks (`callbacks/`, one per file), checkpoint I/O (`checkpoints`), starting from a parent run's weights
(`extension`), the schema of `optim` / `trainer` / `callbacks` and the typed tree of a training run (`config`),
and the narrow protocol by which the callbacks write into the job's record (`job.JobRecord`)."""
