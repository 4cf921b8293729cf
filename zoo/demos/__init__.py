"""Method demos: ``python -m zoo.demos.<method>`` runs the arms of a paper's main comparison at toy scale on CPU and
writes ``docs/results/<method>.md`` (+ a plot). Demos show a mechanism and its direction of effect, not the paper's
numbers."""
