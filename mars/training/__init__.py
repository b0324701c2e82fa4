"""Making a MARS model: the [clean | noisy] batch layout and loss (`objective`), data (`data`), the trainer
(`train`)."""
