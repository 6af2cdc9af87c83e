"""The notebook side: everything here runs in the notebook or IPython, never on a rank."""
