"""Imported by import_sibling.py (found through sys.path[0]); running it alone prints nothing."""
VALUE = 42
