"""``python -m sixlab`` runs the command-line interface."""

from sixlab.cli import main

raise SystemExit(main())
