"""Tables on object storage (S3 and compatible): the client (``objstore``), opening
(``open``: the place and the row sources of :mod:`embstore.store.place.objects` and
:mod:`embstore.store.source`), the key index read by ranges (``ranged``, ``keys``), what
``verify`` downloads (``verify``), upload and download (``transfer``), the helper process
after ``fork`` (``proxy``)."""
