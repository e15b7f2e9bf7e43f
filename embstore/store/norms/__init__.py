"""Row norms stored beside ``vectors`` (the ``norms`` array): computed in blocks (``calc``),
read, kept current and checked (``source``)."""
