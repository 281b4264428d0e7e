"""Where data preparation computes: the interface (base), and the local and Spark executors."""
