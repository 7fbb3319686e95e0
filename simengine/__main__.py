import sys
print("simengine placeholder", sys.argv)
