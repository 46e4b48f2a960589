"""TractLens Qt user interface: the main window, its 3-D and slice views, ROI tools and panels.

Widgets edit the document of ``tractlens.app`` and start its jobs; they hold no algorithm.
The engine and the command line work without this package (and without a display).
"""
