"""The evaluation layer. Importing it registers the built-in evaluations (`builtin`) in the evaluation table
(`registry.EVALUATIONS`)."""

from pelab.evaluation import builtin  # noqa: F401 - registers the built-in evaluations
