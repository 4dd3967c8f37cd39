"""Learning from answers: providers' overflow errors read into corrections, estimates calibrated
against `usage`."""
