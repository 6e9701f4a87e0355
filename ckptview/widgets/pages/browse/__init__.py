"""The Browse tab: a run's serials, its variables, a variable's detail and the verify panel."""
