"""Changing a tree safely: the journal, the tree lock, the journaled Op runner, crash
recovery and the journal's status. Imports nothing of the catalog or the engine."""
