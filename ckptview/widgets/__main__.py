"""``python -m ckptview.widgets APP [panel serve options] --args URL...``: the dashboard's
server (:mod:`ckptview.widgets.shell.server`), what ``ckptview serve`` runs.

Started as a package's ``__main__``, so the worker processes that list files do not import
it again (``multiprocessing`` skips a ``__main__`` module): they load ckptview, not the UI.
"""

from ckptview.widgets.shell.server import main

if __name__ == "__main__":
    main()
