"""Training data: where records come from (sources), TRL's formats and loss masks (formats), packing into rows (packing)."""
