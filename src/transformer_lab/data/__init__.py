"""Data modules and preparation: each data set read, checked and batched for the tasks."""
