"""Use cases as functions of data + parameters, shared by the CLI, the GUI and scripts."""
