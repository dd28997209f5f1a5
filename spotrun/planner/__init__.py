"""The estimate: instance catalog, memory and layout rules, parameters, measured figures, options and the estimate
built from them (estimate.py), and the outputs that cross into the pipeline. Stdlib only (the estimate Lambda)."""
