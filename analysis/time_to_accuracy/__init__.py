"""The time-to-accuracy report of an `attent bench` study: does a selection method reach full data's
accuracy for less method cost, in the regime where that claim applies (its method:
``report``'s docstring); the verdicts against the training-set size; several studies' runs judged
as one. ``attent.analysis`` lists the modules.
"""
