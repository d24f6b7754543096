"""Collective algorithms: schedules as plain data (:mod:`.plans`) and the code that runs them (:mod:`.executor`)."""
