"""``attent rehearse``: an experiment or sweep file run end to end at a stand-in size, on the machine or
cluster it would run on, before its GPU-hours are bought. ``standin`` derives the run from the file (no
Ray, no torch); ``run`` names what cannot be reached, then runs it."""
