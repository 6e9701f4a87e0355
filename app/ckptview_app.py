"""The ckptview dashboard: ``panel serve app/ckptview_app.py --args URL... [--allow-write]``.

``--poll SECONDS`` (after ``--args``) sets how often open pages check the trees for new serials
(default 5; 0: off). Add ``--warm`` (a ``panel serve`` flag, before ``--args``) to catalogue the
trees at startup rather than on the first page. The page itself lives in
:mod:`ckptview.widgets.shell.app` (``ckptview serve URL...`` runs the same script).
"""

import sys

if __name__.startswith("bokeh"):  # run by ``panel serve``
    from ckptview.widgets.shell.app import serve

    serve(sys.argv[1:])
