"""``python -m apps.telemetry``: the rank-side sampler (:func:`apps.telemetry.sampler.main`)."""

from apps.telemetry.sampler import main

raise SystemExit(main())
