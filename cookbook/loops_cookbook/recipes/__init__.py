"""The recipes, one module each (the list is loops_cookbook.registry.RECIPES)."""
