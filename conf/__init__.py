"""Installed as ``zoo.conf``; the folder sits at the top level of the repository by design."""

if __name__ != "zoo.conf":
    raise ImportError(
        "The 'conf' folder of paperzoo is installed as 'zoo.conf'. Use 'import zoo.conf' "
        "(after 'pip install -e .' in the repository root)."
    )

# the resolvers the configs use (${zoo.quick_settings:} of --help): registered before any composition of pkg://zoo.conf
from zoo.cli.resolvers import register_resolvers

register_resolvers()
