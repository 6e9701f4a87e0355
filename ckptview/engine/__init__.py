"""What ckptview does with a scanned tree: statistics, diffs, restore and retention. Each
function takes a :class:`ckptview.scan.core.Scan`; the Catalog passes its own."""
