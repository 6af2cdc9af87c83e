"""The MPI kernel's module before the client/ folder: kernelspecs installed then run
``python -m clusterkernel.kernel``, so this forwards to :mod:`clusterkernel.client.kernel`
(new kernelspecs name that module).

Example::

    python -m clusterkernel.kernel -f connection.json   # as an older kernelspec does
"""

from clusterkernel.client.kernel import main

if __name__ == "__main__":
    main()
