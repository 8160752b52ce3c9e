"""Lets ``python -m spark_analytics`` run the command line."""

import sys
from importlib.util import find_spec

# pyspark and matplotlib are the [analytics] extra: a plain `pip install wamp-retain-router`
# installs the router only, so say how to get them instead of a ModuleNotFoundError traceback
missing = [name for name in ("pyspark", "matplotlib") if find_spec(name) is None]
if missing:
    sys.exit(f"python -m spark_analytics needs {' and '.join(missing)}, which the router alone "
             f"does not install: pip install 'wamp-retain-router[analytics]' (from a clone: "
             f"pip install -e '.[analytics]')")

from spark_analytics.cli import main  # noqa: E402  (only once its dependencies are known here)

sys.exit(main())
