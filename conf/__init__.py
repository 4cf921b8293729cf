"""Installed as ``zoo.conf``; the folder sits at the top level of the repository by design."""

if __name__ != "zoo.conf":
    raise ImportError(
        "The 'conf' folder of paperzoo is installed as 'zoo.conf'. Use 'import zoo.conf' "
        "(after 'pip install -e .' in the repository root)."
    )
