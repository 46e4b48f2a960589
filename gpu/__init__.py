"""TractLens compute engine: arrays in, arrays out, on CuPy or NumPy.

No Qt, no VTK, no files: see ``backend`` for device selection and one module
per method (``dti``, ...).
"""
