"""Telemetry: what the device offers and what a generation costs.

* ``sysfs``: readers rooted at a path (default ``/``) so tests can point them at fake trees;
* ``memory``: process RSS and peak, ``MemAvailable``, Jetson's ``NvMapMemUsed``;
* ``sources``: energy counters (RAPL, NVML) and power sensors (Jetson INA3221 over hwmon or
  IIO, laptop batteries), discovered by the content of ``name`` and label files;
* ``energy``: the trapezoid rule, a background sampler and a per-generation meter;
* ``estimate``: a pair's memory estimate from its manifests, and admission against a budget;
* ``budget``: the budget policy (hysteresis) the engine consults between rounds.
* ``watch``: an engine's :class:`~edgespec.telemetry.watch.Telemetry` and one generation's
  ``Watch`` (its energy meter, and the budget policy around its k policy).

The runtime and the decoder loop never import this package: the engine injects it.
"""
