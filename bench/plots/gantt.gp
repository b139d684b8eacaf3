# The measured timeline of one step (top) above its prediction from the job's measured
# costs (bottom), on one time axis; one row per stage. Call with
#   gnuplot -e "data='gantt.dat'; out='gantt.png'; title_text='...'" gantt.gp
# gantt.dat: panel stage start_ms end_ms kind action (experiment_data.py gantt).
if (!exists("title_text")) title_text = "One step, measured and predicted"
set terminal pngcairo size 1100,560 font "DejaVu Sans,10"
set output out
set termoption noenhanced
stats data using 4 nooutput
tmax = STATS_max
stats data using 2 nooutput
stages = int(STATS_max) + 1
# Colours by kind: F B I W SEND RECV OPT
array colour[7] = [0x4C72B0, 0xDD8452, 0xC44E52, 0x8172B3, 0x55A868, 0xCCCCCC, 0x222222]
set style fill solid 0.9 border lc rgb "white"
set multiplot layout 2,1 title title_text
set xrange [0:tmax * 1.01]
set yrange [stages - 0.5:-0.5]
set ytics 1
set ylabel "stage"
set grid xtics lc rgb "#eeeeee"
set key outside right top box opaque
do for [p = 0:1] {
  set title (p == 0 ? "measured" : "predicted (simulator, costs measured on this job)")
  if (p == 1) { set xlabel "ms since the step began" } else { unset xlabel }
  plot for [k = 0:6] data using (($1 == p && $5 == k) ? ($3 + $4) / 2 : 1/0):2:(($4 - $3) / 2):(0.38) \
         with boxxyerror lc rgb colour[k + 1] \
         title (p == 0 ? word("forward backward backward-input backward-weight send recv-wait optimizer", k + 1) : "")
}
unset multiplot
