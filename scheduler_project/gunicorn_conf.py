"""gunicorn settings every start of this project's web server uses: `gunicorn -c
python:scheduler_project.gunicorn_conf scheduler_project.wsgi ...` (the README's production line,
`quickstart`). Options given on the command line still win over these.

The control socket: gunicorn (since its control interface, `gunicornc`) opens a Unix socket at
`~/.gunicorn/gunicorn.ctl` by default, one path for every gunicorn the same user runs, so a
second instance on the host takes the first one's socket and `gunicornc` then talks to the wrong
server. It is off here; `SCHEDULER_GUNICORN_CONTROL_SOCKET=<path>` turns it on at a path of this
instance's own. (A gunicorn without a control interface ignores these names.)
"""

import os

_socket = os.environ.get("SCHEDULER_GUNICORN_CONTROL_SOCKET", "")
control_socket_disable = not _socket
if _socket:
    control_socket = _socket
