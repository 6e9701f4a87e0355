"""The dashboard's frame: the tabs (app), serving (server), the loading page, the tree
picker and the notebook setup."""
