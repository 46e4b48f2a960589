"""TractLens Qt user interface (main window, views, tools, panels).

The main window arrives with issue 3; the engine and the command line work without it.
"""
