"""Whole runs judged: two runs compared, one run checked against limits (CI), and the history of
many kept in a batch database. Each reads `Analysis` objects and makes the model's `Comparison`,
`Verdict` and `History`."""
