"""One widget a file; each renders one part of `TuiState` and nothing else."""
