"""Fitting and published data: the published runs the estimates are checked against
(``published``, ``published_inference``), measured kernel profiles (``measured``), the fit of
the efficiencies (``calibration``), the memory goldens (``validation``) and the uncertainty
band each estimate carries (``uncertainty``).
"""
