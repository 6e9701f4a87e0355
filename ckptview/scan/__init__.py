"""Reading a tree: listing files through the header cache, the layout's scan, the tables."""
