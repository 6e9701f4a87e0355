"""The dashboard as a ``panel serve`` script (shipped inside the package, so an installed
``ckptview serve`` finds it): ``panel serve ckptview_app.py --args URL... [--allow-write]
[--poll SECONDS]``. The checkout's ``app/ckptview_app.py`` is the same thin script.
"""

import sys

if __name__.startswith("bokeh"):  # run by ``panel serve``
    from ckptview.widgets.shell.app import serve

    serve(sys.argv[1:])
