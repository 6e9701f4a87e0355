"""One module (or package) per dashboard tab: Runs, Browse, Compare, Trajectory, Restore,
Retention, Health."""
