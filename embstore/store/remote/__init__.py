"""Tables on object storage (S3 and compatible): the client (``objstore``), ranged row
reads (``source``, ``chunkcache``), opening (``open``), the key index read by ranges
(``ranged``, ``keys``), ``verify`` over objects (``verify``), upload and download
(``transfer``)."""
