"""PELab's Hydra configs (the YAML files in this folder), shipped as the package `pelab.conf`.

This file makes the folder a regular package, so that every install resolves `pelab.conf` to it: an editable
install to this top-level conf/ (edits apply without a reinstall), a wheel to site-packages/pelab/conf/.
`pelab.CONF_DIR` is its location. Hydra skips this file and __pycache__ when it lists config groups.
"""
