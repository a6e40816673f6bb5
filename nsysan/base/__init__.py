"""What every layer uses and that knows no layer: units (sizes and times, read and written for
people) and CUDA's own names (memory APIs and their families, error codes)."""
