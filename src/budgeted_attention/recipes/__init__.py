"""Recipes: whole programs (``baa demo``, ``baa bench``) composed from the library stages."""
