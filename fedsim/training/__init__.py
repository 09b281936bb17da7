"""Pure torch: models, data sets and partitioning, the DP-SGD step. No clocks, no transports."""
